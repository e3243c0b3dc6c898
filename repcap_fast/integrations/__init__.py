"""Integrations with training frameworks: ``repcap_fast.integrations.transformers.RepcapCallback``
(a Hugging Face ``TrainerCallback`` over ``repcap_fast.monitor.RepresentationMonitor``).

Each integration imports its framework when it is imported itself, never before.
"""
