"""Helpers of the OOM casebook: estimate, measure and plot LLM-training memory (see README.md)."""

import logging


class _KnownNotices(logging.Filter):
    """Drops DeepSpeed's 'Setting accelerator to CPU' notice, printed on every import on a machine without a GPU:
    the collection says where it runs in every result ('measured on'), and the notice reads as a fault in notebooks."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Setting accelerator to CPU" not in record.getMessage()


logging.getLogger("DeepSpeed").addFilter(_KnownNotices())    # the logger DeepSpeed creates on import keeps filters

# bitsandbytes (imported by peft, and by the readers' and fixes' paths through transformers) looks for a 4-bit CPU
# kernel on the Hugging Face hub at import and warns when the `kernels` package is absent: nothing is downloaded at
# run time here, and its own CPU kernels run the scaled runs (helpers.measure.nf4).
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
