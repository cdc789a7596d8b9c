"""Evidence that a conversion kept the numbers: bitwise for weights (program parity pending)."""
