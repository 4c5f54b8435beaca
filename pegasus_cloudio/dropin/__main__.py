"""``python -m pegasus_cloudio.dropin``: the same as ``pegasus-cloudio-transfer``."""

from pegasus_cloudio.dropin.launch import console_main

console_main()
