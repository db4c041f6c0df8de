"""Kovaleva et al. (2019)'s numbers on disabling heads and layers, as `bertscope heads disable`'s
section quotes them."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, KOVALEVA, Number, Source

# Kovaleva et al. (2019), Revealing the Dark Secrets of BERT, section 4.6 (disabling heads and
# layers), ../shared/papers/kovaleva2019-revealing-dark-secrets.txt: changes of the task
# metric in points, from the text beside Figures 8-9 (single runs on the GLUE dev sets).
DISABLE = Source(KOVALEVA, "section 4.6, Figures 8-9", BERT_BASE, "GLUE dev sets, one fine-tuned model per task")
DISABLE_NUMBERS = {
    "head_gain_max": Number(1.2, DISABLE),  # the largest gain from disabling one head (MRPC)
    "head_gain_min": Number(0.1, DISABLE),  # the smallest such best gain over the tasks (STS-B)
    "rte_layer1_gain": Number(3.2, DISABLE),  # RTE with the first layer disabled
    "layer_drop_max": Number(-0.2, DISABLE),  # the largest drop from disabling a layer (QNLI, MNLI)
}
DISABLE_TEXT = {
    "heads": ("disabling some single head improves every task, by 0.1 (STS-B) to 1.2 points (MRPC); on MRPC "
              "and RTE disabling a random head helps on average"),
    "layers": ("disabling a whole layer also helps; on RTE disabling the first layer gives +3.2 points; on QNLI "
               "and MNLI it costs up to 0.2 points"),
}
