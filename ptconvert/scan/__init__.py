"""The pickle security scanner and the symbolic pickle machine every pickle read goes through."""
