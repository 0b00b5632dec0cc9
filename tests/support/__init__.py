"""Helpers the tests share (and bench/ uses): plain modules, imported by tests, conftest.py files and bench
scripts alike. Fixtures stay in conftest.py files; no test module is imported by another."""
