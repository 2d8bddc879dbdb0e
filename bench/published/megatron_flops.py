"""Megatron-LM's count of a step's FLOPs (Narayanan et al., SC'21, eq. 3): 96 B s l h^2
(1 + s / 6h + V / 16 l h), full recomputation and the whole s x s attention counted, so a
prediction's TFLOP/s per GPU compare with the paper's Table 1 as the paper counts them."""

SEQ, VOCAB = 2048, 51200


def step_flops(hidden, layers, batch):
    h, l, b = float(hidden), float(layers), float(batch)
    return 96 * b * SEQ * l * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * l * h))


def rows(path):
    """The table's rows as dicts (bench/published/megatron-sc21-table1.tsv)."""
    keys = ["params", "heads", "hidden", "layers", "tp", "pp", "gpus", "batch", "published", "held"]
    out = []
    for line in open(path):
        if line.strip() and not line.startswith("#"):
            out.append(dict(zip(keys, line.split())))
    return out
