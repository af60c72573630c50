"""`eaglewire doctor`: find a hidden-state wiring bug in one command instead of days."""
