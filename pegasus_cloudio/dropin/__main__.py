"""``python -m pegasus_cloudio.dropin``: the same as ``pegasus-cloudio-transfer``."""

from pegasus_cloudio.dropin.main import console_main

console_main()
