"""Helpers the test files share (toy profiles, scenario writers, episode loops, controllers, submissions): one
place to import them from, so no test file imports another. ``pythonpath = ["tests"]`` (pyproject) puts this package
on the path wherever a test file sits."""
