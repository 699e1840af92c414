"""opencode-boxd guest helper: owns the guest side of one work (docs/guest.md).

Shipped as one zipapp, `helper-<sha256>.pyz`, that the laptop uploads to the machine's
home and runs once per step through `boxd machine exec`. The modules by job: protocol
(protocol.json, the answer's shape), cli (the commands), state (a work's files and runs),
pump (the daemon that feeds prompts to OpenCode), server (`opencode serve`), opencode
(its executable and HTTP API), gitstate (the tree as git sees it), files (paths and
sizes crossing the line), disk (durable writes, locks), procs (processes, machine health).
Python 3.10+, standard library only.
"""
