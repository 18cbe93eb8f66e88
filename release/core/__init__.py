"""Infrastructure every layer may use: errors, hashing, files, processes, the package format. Imports nothing
from the pipeline, the commands, the registry or a backend's engine."""
