"""The HTCondor multi-file transfer plugin (``pegasus-cloudio-condor-plugin``).

``plugin``: the command (``-classad`` query, ``-infile/-outfile [-upload]`` transfers).
``ads``: reading the starter's input ads and writing result ads (``classad2``, imported lazily).
``outcome``: one failed file -> ``TransferError`` text, ``TransferErrorData`` and exit codes.
``environment``: how settings and credentials reach the plugin on the execute node.
``credentials``: bearer tokens from ``$_CONDOR_CREDS`` and which credential source a URL used.
``http_transfers``: http(s) uploads (single PUT, e.g. to pre-signed URLs) and token downloads.

See docs/condor.md for installation and the protocol contract.
"""

from pegasus_cloudio.version import __version__ as PLUGIN_VERSION

__all__ = ["PLUGIN_VERSION"]
