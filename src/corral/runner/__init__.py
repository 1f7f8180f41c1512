"""The runner: claims runs from a coordinator and executes them as supervised processes."""
