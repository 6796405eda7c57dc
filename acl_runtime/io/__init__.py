"""File and folder I/O every command shares (standard library only: the serving path imports it)."""
import hashlib


def file_sha256(path: str) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB blocks (checkpoints, exported graphs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
