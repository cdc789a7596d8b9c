"""The pickle security scanner: what a file holds and whether loading it would run code (it reads
pickles with ``ptconvert.pickles``' machine, the one every pickle read goes through)."""
