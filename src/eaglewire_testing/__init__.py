"""The test harness: tiny datasets and drafters, fake and real servers, engine venvs, engine code readers.

A package of its own (installed with eaglewire) so the tests and the benchmarks import it
the same way, without editing sys.path. Nothing in `eaglewire` imports it.
"""
