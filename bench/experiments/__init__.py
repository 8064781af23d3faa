"""Learning experiments: whether a judge, a PRM or a budget learns or saves what it should, with
intervals and every seed (docs/experiments/)."""
