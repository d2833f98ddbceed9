"""One adapter per toolkit that `scripts/compare_peers.py` runs. Each module has `KEYS` (the
`--only` names it answers) and `run(args, shared, only) -> list[Result]`: it installs its
toolkit, trains the reference model for `--minutes`, reads its speed from its log and decodes
the test set greedily and with beam 5. The next peer is one new module here, named in
`ADAPTERS`.
"""

from peers import joey, nmt_toolkit, opennmt

# In the order of the table's rows: OpenNMT-py first, the baseline of every ratio.
ADAPTERS = (opennmt, joey, nmt_toolkit)
