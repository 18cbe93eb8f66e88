"""Pipeline stages, in order: intake, merge, convert, validate, package, (gates), register."""
