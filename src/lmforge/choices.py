"""The names of every closed choice a config may make: the one list each, read by config validation, the command
line, error messages and the implementations' own tables (whose keys a test holds equal to these names).

They live here, in the lowest layer and free of PyTorch, because ``config.py`` validates them and the command line
offers them before any model code is imported.
"""

from __future__ import annotations

# models (ModelConfig; one config class per family in lmforge.config.families): implemented in lmforge.models,
# nn.rnn.CELLS, nn.attention.SCORES / KERNELS,
# nn.positional, nn.feedforward.ACTIVATIONS
ARCHITECTURES = ("encoder", "decoder", "seq2seq", "seq2seq_encoder", "rnn", "rnn_seq2seq", "bilm", "elmo", "awd_lstm",
                 "xlnet")
# Which families are Transformers (sized by n_heads and d_ff) is said once, by each family's config class
# (lmforge.config.families: ``transformer``); which are recurrent, by the models registry (``recurrent``).
# the biLM's token layer (models.elmo): a character CNN over each token's bytes, or a token embedding table
TOKEN_ENCODERS = ("chars", "embedding")
RNN_CELLS = ("gru", "lstm")
ATTENTION_SCORES = ("additive", "dot", "scaled_dot", "general", "cosine", "location")
# the RNN encoder-decoder's ``attention``: a score, or "none" (no attention: one fixed context vector, Cho et al. 2014)
RNN_SEQ2SEQ_ATTENTIONS = (*ATTENTION_SCORES, "none")
# local attention's centre p_t (nn.attention.Attention): local-m (p_t = t) or local-p (predicted, Gaussian-weighted)
LOCAL_ALIGNMENTS = ("monotonic", "predictive")
# where the RNN decoder attends (models.rnn_seq2seq): after its step with h_t (Luong) or before it with s_{i-1}
DECODER_ORDERS = ("luong", "bahdanau")
# how hard attention's sampled choice gets a gradient (nn.attention.Attention)
HARD_ATTENTION_ESTIMATORS = ("straight_through", "reinforce")
POSITIONALS = ("learned", "sinusoidal", "rotary")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "gelu_sigmoid")
KERNELS = ("math", "sdpa")
# the Transformer layers' feed-forward (nn.feedforward.FeedForward): Vaswani et al.'s two-layer MLP, or the gated
# variant (Shazeer 2020, "GLU Variants Improve Transformer": act(x W) * (x V) then W2; GEGLU with GELU, as in
# Cramming)
FFNS = ("mlp", "gated")
# ALBERT's cross-layer parameter sharing (Lan et al. 2020, section 3.1; models.encoder): every layer one set of
# weights ("all"), only the attention or only the feed-forward sublayers shared, or none (BERT)
LAYER_SHARINGS = ("none", "all", "attention", "ffn")
# XLNet's attention (models.xlnet): "bi" (every position may see every other; permutation masks decide) or "uni"
# (causal, Transformer-XL)
XLNET_ATTN_TYPES = ("bi", "uni")

# training (TrainConfig): lmforge.training.optim, the Trainer's autocast
# slanted_triangular: ULMFiT's STLR (Howard & Ruder 2018, eq. 3)
SCHEDULES = ("linear", "cosine", "constant", "inverse_sqrt", "slanted_triangular")
PRECISIONS = ("fp32", "bf16", "auto")  # auto: lmforge.training.precision
PARALLELS = ("ddp", "fsdp")  # TrainConfig.parallel: how several processes spread the model
# adamw: decoupled weight decay (Loshchilov & Hutter 2019); lamb: LAMB (You et al. 2020), layer-wise trust ratios;
# nt_asgd: SGD, then the average of its iterates once the held-out loss stops improving (Merity et al. 2018)
OPTIMIZERS = ("adamw", "lamb", "nt_asgd")

# pretraining data (DataConfig): lmforge.data.masking.mask_tokens
MASKINGS = ("token", "whole_word", "span", "ngram")

# fine-tuning (TaskConfig): lmforge.tasks, lmforge.data.schemes, lmforge.nn.pooling, lmforge.heads.span
TASKS = ("sequence", "pair", "token", "span", "qa", "choice")
# how a task's inputs are laid out: BERT's [CLS] a [SEP] b [SEP], GPT-1's [START] a [DELIM] b [EXTRACT]; auto: by family
INPUT_FORMATS = ("auto", "bert", "gpt")
LONG_TEXT = ("truncate", "head-tail", "chunks")
TAG_SCHEMES = ("BIO", "IOB1", "BIOES")
WORD_POOLINGS = ("first", "mean")
SEQUENCE_POOLINGS = ("cls", "mean")  # --task.pooling: the pooled [CLS] output, or the mean of the final states
SPAN_POOLINGS = ("mean", "attention")

# static embeddings (lmforge.embeddings.word2vec): the reference per-pair loop or the batched approximation
WORD2VEC_MODES = ("exact", "fast")

# contextual embeddings (lmforge.embeddings.contextual, lmforge embed) and the attention viewer (lmforge.viz.html)
TEXT_POOLINGS = ("none", "mean", "cls")
VIEWER_PRECISIONS = ("auto", "float32", "uint16", "uint8")
# the attention PNG's colour scale (lmforge.viz.plots): weights 0..1 for every heat map, or each from 0 to its own
# largest weight
ATTENTION_SCALES = ("absolute", "relative")
# what runs a model folder's backbone for inference (lmforge.persistence.onnx): PyTorch, or ONNX Runtime from the
# folder's onnx/ graph (lmforge convert --to-onnx)
RUNTIMES = ("torch", "onnx")
# the Hugging Face families an encoder can be written as (``lmforge convert --to-hf --hf-layout``)
HF_ENCODER_LAYOUTS = ("bert", "roberta", "albert", "distilbert", "electra")
