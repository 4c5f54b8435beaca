"""Request and byte cost of a workflow's staging, priced with a price table.

`records` reads what the drop-in (or stock ``pegasus-transfer``) recorded: the
``transfer_attempts`` monitoring records in a Pegasus submit directory or multipart files;
`prices` holds the price tables (published list prices with their date, and the 2010 prices
of the seed study); ``pegasus-cloudio cost`` (`cli`) prints the bill per site and job type.
"""
