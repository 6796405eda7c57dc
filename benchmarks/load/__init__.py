"""The load tests' shared parts (serve_load.py, serve_hey.py, serve_stop.py, serve_speed.py): the client process
that drives acl-serve (``client``, run by path as its own process), the server process started, probed and stopped
(``server``), one serve_load configuration's phases against a live server and the reference engine between them
(``phases``), the arithmetic of a phase and the targets' verdicts (``stats``), the interleaved refill/no-refill pairs
(``pair``), and the child process that measures an engine's peak memory (``serve_child``, run by path)."""
