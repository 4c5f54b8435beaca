"""``pegasus-cloudio-s3``: a drop-in for Pegasus's ``pegasus-s3`` (5.1.3) on the transfer library."""
