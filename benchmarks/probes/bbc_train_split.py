"""Write the training split of BBC News (the split `lmforge compare` makes: test_fraction 0.2, split_seed 0) to a CSV,
so that a probe comparison run on it carves its own held-out part from the training articles: settings chosen on
that part never see the comparison's test articles.

    .venv/bin/python benchmarks/probes/bbc_train_split.py runs/probe36/bbc-train.csv
"""

import sys
from pathlib import Path

from lmforge.data.readers import stratified_split
from lmforge.recipes.compare import compare_config
from lmforge.recipes.compare.data import load_labelled, write_csv

config = compare_config({"approach": [{"name": "a", "model": "bert-mini"}]}, "probe")
pairs = load_labelled(config)
train, _ = stratified_split([label for _, label in pairs], config.test_fraction, config.split_seed)
out = Path(sys.argv[1])
out.parent.mkdir(parents=True, exist_ok=True)
write_csv(out, [pairs[i] for i in train])
print(f"{len(train)} training articles -> {out}")
