"""`python -m kvops` is the same as the `kvops` console script."""

from kvops.cli import main

if __name__ == "__main__":
    main()
