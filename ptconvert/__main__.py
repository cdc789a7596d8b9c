from ptconvert.cli import entry

entry()
