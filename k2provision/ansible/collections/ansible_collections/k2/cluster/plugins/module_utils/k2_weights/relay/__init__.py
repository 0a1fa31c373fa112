"""Pipelined weight relay: moves a manifest's files along a chain of hosts at line rate.

Standard library only, Python 3.9 or later (a test runs it under 3.9). It travels as one file,
``relay.pyz``, a zipapp of the whole ``k2_weights`` package (k2provision.weights.relay_app
builds it, byte for byte the same for the same sources), and runs with each host's own
``python3``. Modules, one concern each: ``protocol`` (frames, connections, options),
``pipeline`` (the receiving host's write and hash threads, resume points), ``forwarder``
(linking, forwarding, re-linking), ``receiver`` (``serve``), ``seed`` (``send``), ``output``
(events, counters, CPU by stage), ``cli``.

Commands
--------
On every receiving host, started first (one process per host; it exits after one complete
stream, or when no upstream comes within ``--accept-timeout`` / ``--relink-timeout``)::

    python3 relay.pyz serve --dest /models/Kimi-K2 [--listen 0.0.0.0:29517] [--name NAME]
                            [--manifest FILE] [--verify] [--checkpoint BYTES]

On the seed (the host that holds the files, or the controller)::

    python3 relay.pyz send --source DIR --manifest FILE|- --chain H1:P,H2:P,... [--fanout]
                           [--verify] [--max-rate BYTES_PER_S] [--chunk-size BYTES]

Local check only (no network)::

    python3 relay.pyz check --dest DIR --manifest FILE [--verify]

``send`` connects to the first host of ``--chain``; every host forwards the stream to the
next one while it is still receiving it, so all hosts finish in about size / link rate.
With ``--fanout`` the seed opens one stream per host instead (the baseline: N streams on
the seed's one link). ``--manifest -`` reads the manifest from standard input.

Output: one JSON object per line on stdout. Every line has ``event`` and ``host``; the
events are ``listening`` (address, port), ``plan``, ``progress`` (rx, tx, written, total,
rate in bytes/s), ``file`` (name, status, reason), ``resume`` (name, offset), ``skip`` /
``relink`` (a downstream host dropped out and the chain was re-linked around it),
``refused`` (message) and, last, ``summary``: status (ok, incomplete, refused, cancelled),
verified (count), skipped (files already verified in place, nothing transferred), received,
repaired (present but wrong, sent again), resumed (name and offset of files continued from a
partial copy), failed (name, reason), missing, skipped_hosts, byte counters, ``cpu`` (CPU
seconds by stage: receive, hash, write, forward, read; and the process's user and system
time) and, from the seed, ``hosts``: the summary of every host of the chain. Exit codes:
0 ok, 1 incomplete, 2 usage, 3 refused (disk space, bad source), 4 cancelled (SIGTERM/SIGINT).

Protocol (TCP, one connection per link)
---------------------------------------
Every message is a frame: 1 byte type, 4 byte big-endian length, payload.

``H`` hello, down: JSON with the manifest, the rest of the chain (every host below the
receiver, in order), the chunk size, the timeouts and the verify flag. The receiver starts
checking its own files and, at the same time, links to the first reachable host of that chain.
``N`` need, up: {name: first byte wanted} for what this host or any host below it lacks (or
holds wrong); a host holding a verified prefix of a file asks from the end of that prefix,
and the sender streams each file from the lowest byte anyone below wants. A host that already
has a file (or that part of it) still forwards it.
``F`` file, down: JSON name, size, sha256 and offset, then ``D`` data frames carrying the
bytes from offset to the end. ``Z`` end of stream, down. ``R`` report, up: the summaries of
this host and every host below. ``K`` keepalive, up, while a host waits on its own downstream
or its disk. ``X`` error, up: the receiver refused the hello (bad manifest, wrong protocol).

Received bytes are handed on as they arrive (every 10 ms, 64 KiB to 4 MiB at a time, long
before a frame is complete): a writer thread writes them to ``<dest>/.<name>.partial`` and
has the forwarder send them on from the page cache with sendfile(2); one hashing thread per
file computes its sha256. A file gets its final name only when size, sha256 and (for
``*.safetensors``) the header check agree with the manifest. ``<dest>/.k2-manifest.json``
records what was verified (with each file's mtime), so a re-run checks sizes and mtimes
instead of re-hashing; ``--verify`` re-hashes everything. Every ``--checkpoint`` bytes the
writer syncs the partial file, drops its forwarded pages from the page cache and saves a
resume point (bytes on disk, sha256 state); a re-run continues an interrupted file there.

Faults: if a downstream host dies, the host above it links to the next host of the chain,
reports the dead one as skipped, forwards the rest of the stream, and afterwards sends
the files the new downstream still lacks from its own verified copies. Hosts below a
broken link keep their partial file and its resume point and wait (``--relink-timeout``)
for a new upstream. Free disk space is checked before any byte is written; a host without
room says so (host, free, needed) and only passes the stream on.
"""
