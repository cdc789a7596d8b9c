"""Weight sets: any weights source read into entries (byte ranges or tensors), and the writers."""
