"""Small shared values used on several floors: positions in the change log, retry backoff, check findings.
Pure: no I/O, and no import of any other room of the package."""
