"""Deployment manifests for existing platforms, rendered from relctl's templates (`relctl render ...`)."""
