"""Release signing: the key that signs a release, the keys trusted to have signed one (keys.py), and the
OpenSSF model-signing signature over a package folder with its provenance (package.py)."""
