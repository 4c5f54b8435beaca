"""The node stager: one long-lived process per user and node that runs ``pegasus-transfer``.

A staging job pays ~80 ms of CPU to start Python and import the drop-in before it moves a
byte; on a node whose cores are busy computing, two such starts per job are most of the cost
of staging (see ``docs/benchmarks.md``, workflow makespan). ``pegasus-cloudio stager``
imports everything once and forks a ready copy of itself per request. The drop-in hands its
command line, environment, working directory, umask and standard streams to the stager when
``PEGASUS_CLOUDIO_STAGER`` names the stager's socket, so a job behaves exactly as if it ran
in-process (same output, exit code, files), and falls back to running in-process when no
stager answers.

``wire``: the framing both sides share; ``client``: the drop-in's side (standard library
only, imported before anything else); ``server``: the stager; ``cli``: its command.
"""
