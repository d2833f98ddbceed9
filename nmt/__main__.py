"""`python -m nmt` = the `nmt` command (also what `torchrun -m nmt` runs)."""

from nmt.cli import app

if __name__ == "__main__":
    app()
