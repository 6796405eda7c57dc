"""File and folder I/O every command shares (standard library only: the serving path imports it)."""
