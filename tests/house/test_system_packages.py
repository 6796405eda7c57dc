"""scripts/system_packages.sh: a package is keyed on what shows it is there, a command or a shared library
(scripts/system_packages.tsv), so that a library only it installs (perf_analyzer's libb64.so.0d) is not taken as
present because every command is."""
import os
import stat
import subprocess

from helpers import REPO

SCRIPT = os.path.join(REPO, "scripts", "system_packages.sh")


def _check(tmp_path, libraries):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for cmd in ("qemu-x86_64", "pg_ctlcluster", "hey"):  # every command present
        (bin_dir / cmd).write_text("#!/bin/sh\n")
        (bin_dir / cmd).chmod(0o755)
    ldconfig = tmp_path / "ldconfig"
    ldconfig.write_text("#!/bin/sh\necho '3 libs found in cache'\n" + "".join(
        f"printf '\\t{lib} (libc6,x86-64) => /lib/{lib}\\n'\n" for lib in libraries))
    ldconfig.chmod(ldconfig.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "LDCONFIG": str(ldconfig)}
    return subprocess.run(["bash", SCRIPT, "--check"], capture_output=True, text=True, env=env)


def test_a_missing_library_is_missing_even_when_every_command_is_there(tmp_path):
    proc = _check(tmp_path, ["libc.so.6", "libb64.so.0"])  # a near name is not the library
    assert proc.returncode == 1 and proc.stdout.strip() == "[system] missing: libb64-0d"


def test_with_the_library_in_the_linkers_cache_everything_is_present(tmp_path):
    proc = _check(tmp_path, ["libc.so.6", "libb64.so.0d"])
    assert proc.returncode == 0 and "libb64-0d" in proc.stdout and "present" in proc.stdout
