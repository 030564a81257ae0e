"""Integrations with the training frameworks people run on spot machines, each an optional extra.

- `preemptible.integrations.transformers.PreemptibleCallback`: the Hugging Face ``Trainer`` (``[transformers]``).

Each takes the same options as `preemptible.Run` where they apply, and has the same shape: register the callback
the framework's usual way, and pass ``cb.resume_from`` to the framework's own resume argument.
"""
