"""Prefect flows: thin glue that runs a package, turns its result into a record, and hands the
records to adrkit. All logic lives in the packages."""
