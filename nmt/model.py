"""Bidirectional-RNN encoder, bridge, output layer, and the Seq2Seq model that joins them to
an attention decoder (`nmt.decoder`).

`Seq2Seq.encode` runs once per batch of sentences and returns an `Encoded` (states, projected
attention keys, mask, initial decoder state); `Seq2Seq.step` advances every sentence by one
target token for greedy and beam search; `Seq2Seq.forward` is the teacher-forced pass used in
training. `forward` and `step` share their per-step code (the decoders' `_step_core`), and
the output layer runs once over all target positions. `build_model` is the only place that
reads ModelConfig.

Shape legend: B batch, S source length, T target length, E embedding size, He encoder hidden
size per direction, Hd decoder hidden size, L layers, V vocabulary, D pre-output size.
"""

# long: the model's parts (encoder, bridge, output layer) and the model that joins them;
# the decoders, attention and copy attention are modules of their own.

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt import int8, laid_out, onednn, vml
from nmt.attention import build_attention, weighted_sum
from nmt.config import ModelConfig
from nmt.copy import CopyGate, mixture_log_probs
from nmt.decoder import (
    BahdanauDecoder,
    Decoder,
    DecoderState,
    Encoded,
    LuongDecoder,
    rnn_layer,
    run_rnn,
    split_rnn_state,
)
from nmt.dropout import Dropout
from nmt.encoder_loop import applies as encoder_loop_applies
from nmt.encoder_loop import encoder_loop
from nmt.int8 import Int8Rows
from nmt.laid_out import LaidOut
from nmt.runtime import autocast_dtype
from nmt.shortlist import Restricted, Shortlist


class Encoder(nn.Module):
    """Bidirectional RNN over the embedded source, packed so that padding never enters it.
    Training on a CPU, a 1-layer GRU runs in `nmt.encoder_loop` (same numbers, one
    weight-gradient product per weight)."""

    fused = True  # by nmt.encoder_loop where it applies; False: nn.GRU always

    def __init__(
        self, *, cell: str, input_size: int, hidden_size: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.output_size = 2 * hidden_size
        self.rnn = rnn_layer(
            cell,
            input_size=input_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
            bidirectional=True,
        )

    def forward(self, emb: Tensor, lens: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Encode embedded sources.

        emb: (B, S, E); lens: (B,) int64 real lengths on the CPU, as packing needs.
        Returns states (B, S, 2He) with zeros on padding, and the final hidden state and
        (LSTM) cell state per layer, forward and backward concatenated: (Le, B, 2He).

        Rows sorted by decreasing length (`nmt.batching.collate` sorts them) are packed as
        they are; others are sorted by the packing, which on a GPU costs two blocking copies
        of the sort indices. The check reads CPU lengths: no sync.
        """
        if lens.device.type != "cpu":  # a caller's mistake, corrected (one copy)
            lens = lens.cpu()
        if self.fused and encoder_loop_applies(self.rnn, emb, lens):
            states, h = encoder_loop(self.rnn, emb, lens)  # (B, S, 2He), (2, B, He)
            return states, self._merge_directions(h), None
        is_sorted = bool((lens[:-1] >= lens[1:]).all())
        packed = pack_padded_sequence(emb, lens, batch_first=True, enforce_sorted=is_sorted)
        out, final = run_rnn(self.rnn, packed, None)
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=emb.size(1))
        h, c = split_rnn_state(final)
        return states, self._merge_directions(h), None if c is None else self._merge_directions(c)

    def _merge_directions(self, h: Tensor) -> Tensor:
        """(2 Le, B, He), directions interleaved per layer -> (Le, B, 2He)."""
        h = h.view(self.num_layers, 2, h.size(1), h.size(2))  # (Le, 2, B, He)
        return torch.cat([h[:, 0], h[:, 1]], dim=-1)  # (Le, B, 2He)


class Bridge(nn.Module):
    """Initial decoder state from the encoder's final states, per layer: tanh(W [h_fwd; h_bwd])
    (`linear`) or [h_fwd; h_bwd] itself (`copy`, OpenNMT-py's default: needs Hd = 2He, which
    the config checks).

    Encoder layer i starts decoder layer i when the layer counts match; otherwise the top
    encoder layer starts every decoder layer. One W serves all layers; an LSTM's cell state
    gets its own W.
    """

    def __init__(
        self,
        *,
        enc_size: int,
        dec_hidden: int,
        enc_layers: int,
        dec_layers: int,
        lstm: bool,
        copy: bool = False,
    ) -> None:
        super().__init__()
        self.dec_layers = dec_layers
        self.layerwise = enc_layers == dec_layers
        self.hidden = None if copy else nn.Linear(enc_size, dec_hidden)
        self.cell = nn.Linear(enc_size, dec_hidden) if lstm and not copy else None

    def forward(self, final: Tensor, final_cell: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(Le, B, 2He) final states -> (Ld, B, Hd) initial decoder hidden and cell states."""
        if self.hidden is None:  # copy
            c = None if final_cell is None else self._layers(final_cell)
            return self._layers(final), c  # (Ld, B, Hd)
        h = vml.tanh(onednn.layer(self.hidden, self._layers(final)))  # (Ld, B, Hd)
        if self.cell is None or final_cell is None:
            return h, None
        return h, vml.tanh(onednn.layer(self.cell, self._layers(final_cell)))  # (Ld, B, Hd)

    def _layers(self, final: Tensor) -> Tensor:
        return final if self.layerwise else final[-1:].expand(self.dec_layers, -1, -1)


class Generator(nn.Module):
    """Output layer: pre-output states -> vocabulary logits, optionally tied to an embedding.

    Tying makes the output weight the target embedding matrix (V, E), so the pre-output size
    D must equal E: when it does not, a bias-free Linear D -> E comes first.
    """

    def __init__(
        self, *, input_size: int, vocab_size: int, dropout: float, tie_to: nn.Embedding | None
    ) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        size = input_size if tie_to is None else tie_to.embedding_dim
        self.proj = nn.Linear(input_size, size, bias=False) if size != input_size else None
        self.out = nn.Linear(size, vocab_size)
        if tie_to is not None:
            self.out.weight = tie_to.weight
        # int8 rows (nmt.int8.quantize) or bf16 rows (nmt.laid_out.lay_out): decoding only
        self.out_packed: Int8Rows | LaidOut | None = None

    def forward(self, x: Tensor, vocab: Restricted | None = None) -> Tensor:
        """(B, [T,] D) -> logits (B, [T,] V); with `vocab`, the logits of its L columns only
        (B, [T,] L), in the order of `vocab.columns`. An int8 model's are float32."""
        x = self.dropout(x)
        if self.proj is not None:
            x = onednn.layer(self.proj, x)  # (B, [T,] E)
        if vocab is not None:
            return _product(x, vocab.weight, vocab.bias)  # (B, [T,] L)
        weight = self.out.weight if self.out_packed is None else self.out_packed
        return _product(x, weight, self.out.bias)  # (B, [T,] V)

    def restrict(self, columns: Tensor) -> Restricted:
        """The output layer cut to `columns` (L,) int64 target ids, for a batch's decoding;
        in autocast's dtype where it is on: the cut is no parameter, so autocast would cast
        it again at every step (its cast cache keeps parameters only)."""
        # index_select, not weight[columns]: 1.6× faster for float32 rows, 6× for int8 ones
        # (8,000 × 512, 3,500 rows: 596 against 944 µs, 176 against 1,007; session 29)
        bias = self.out.bias.index_select(0, columns)  # (L,)
        if self.out_packed is not None:  # int8 or laid-out rows: what the model multiplies
            return Restricted(columns, self.out_packed.rows(columns), bias)
        weight = self.out.weight.index_select(0, columns)  # (L, E)
        dtype = autocast_dtype(weight.device.type)
        if dtype is not None:
            weight, bias = weight.to(dtype), bias.to(dtype)
        return Restricted(columns, weight, bias)


def _product(x: Tensor, weight: Tensor | Int8Rows | LaidOut, bias: Tensor) -> Tensor:
    """x (..., E) -> x·weightᵀ + bias (..., N), through int8 (`nmt.int8`), bf16 laid out
    (`nmt.laid_out`) or oneDNN."""
    if isinstance(weight, Int8Rows):
        return int8.linear(x, weight, bias)
    if isinstance(weight, LaidOut):  # its own bias, cut with its rows: `bias` is that
        return laid_out.linear(x, weight)
    return onednn.linear_layer(x, weight, bias)


@dataclass
class Output:
    """What the teacher-forced pass gives: the loss (`nmt.step.token_loss`) reads it all."""

    logits: Tensor  # (B, T, V) vocabulary logits
    attention: Tensor  # (B, T, S) float32, zero on padding
    src: Tensor  # (B, S) the source ids
    gate: Tensor | None = None  # (B, T) float32 logit of g (generate); None: no copy attention
    heads: Tensor | None = None  # (B, H, T, S) each head's weights, when asked for

    @property
    def copied(self) -> Tensor | None:
        """(B, T) the share of each target token's probability copied from the source, 1 − g."""
        return None if self.gate is None else torch.sigmoid(-self.gate)


class Seq2Seq(nn.Module):
    """Attention-based encoder-decoder: `encode` once, then `step` or teacher-forced `forward`.
    With a `copy_gate` (`model.copy`) its output distribution is the pointer-generator
    mixture of `nmt.copy`."""

    def __init__(
        self,
        *,
        src_embed: nn.Embedding,
        tgt_embed: nn.Embedding,
        encoder: Encoder,
        bridge: Bridge | None,
        decoder: Decoder,
        generator: Generator,
        dropout: float,
        pad_id: int,
        copy_gate: CopyGate | None = None,
    ) -> None:
        super().__init__()
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.encoder = encoder
        self.bridge = bridge  # None: the decoder starts from zeros
        self.decoder = decoder
        self.generator = generator
        self.copy_gate = copy_gate  # None: no copy attention
        self.dropout = Dropout(dropout)
        self.pad_id = pad_id
        self.src_vocab_size = src_embed.num_embeddings
        self.tgt_vocab_size = tgt_embed.num_embeddings
        self._dec_shape = (decoder.rnn.num_layers, decoder.rnn.hidden_size)
        # A vocabulary shortlist (`nmt.shortlist`) decoding restricts the output layer to;
        # set by `Translator` from the checkpoint, never while training.
        self.shortlist: Shortlist | None = None

    def encode(self, src: Tensor, src_lens: Tensor) -> Encoded:
        """src (B, S) int64 ending in EOS, src_lens (B,) int64 on the CPU -> Encoded."""
        emb = self.dropout(self.src_embed(src))  # (B, S, E)
        states, final, final_cell = self.encoder(emb, src_lens)
        # From the ids, not from src_lens: those live on the CPU, and copying them to a GPU
        # would block on every forward pass. Real tokens are never PAD.
        mask = src != self.pad_id  # (B, S)
        if self.bridge is not None:
            h0, c0 = self.bridge(final, final_cell)
        else:
            layers, hidden = self._dec_shape
            h0 = states.new_zeros(layers, src.size(0), hidden)  # (Ld, B, Hd)
            c0 = None if final_cell is None else torch.zeros_like(h0)
        keys = self.decoder.attention.project_keys(states)  # (B, S, Dp)
        dtype = None if self.training else autocast_dtype(states.device.type)
        if dtype is not None:  # decoding under autocast: the values cast once, not every step
            states = states.to(dtype)  # (the keys stay as the scorer made them: see
            # `nmt.attention.additive_hidden`, float32 keys take its faster route)
        vocab = None
        if self.shortlist is not None and not self.training:  # decoding: a batch's columns
            columns = self.shortlist.columns(src, self.generator.out.out_features)  # (L,)
            vocab = self.generator.restrict(columns)
        # What copy attention scatters onto the step's scores: target ids, or with a
        # shortlist their positions among its columns (once a batch, not once a step).
        copy_to = src if vocab is None else vocab.positions(src)  # (B, S)
        return Encoded(
            states=states, keys=keys, mask=mask, final=h0, final_cell=c0, src=copy_to, vocab=vocab
        )

    def init_state(self, enc: Encoded) -> DecoderState:
        return self.decoder.init_state(enc)

    def step(
        self, prev: Tensor, state: DecoderState, enc: Encoded
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev (B,) int64 previous target token -> logits (B, V), new state, attention (B, S).

        With copy attention the "logits" are the mixture's log-probabilities (float32): the
        searches normalise what they get, and log-probabilities are their own normalisation.
        With a shortlist (`enc.vocab`) they cover its L columns only: (B, L).
        """
        emb = self.dropout(self.tgt_embed(prev))  # (B, E)
        pre, state, weights = self.decoder.step(emb, state, enc)
        logits = self.generator(pre, enc.vocab)  # (B, V)
        if self.copy_gate is None:
            return logits, state, weights
        assert enc.src is not None
        gate = self.copy_gate(pre, weighted_sum(weights, enc.states, enc.group), emb)  # (B,)
        return mixture_log_probs(logits, gate, weights, enc.rows(enc.src)), state, weights

    def forward(self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, heads: bool = False) -> Output:
        """Teacher forcing: src (B, S) int64, src_lens (B,) int64 CPU, tgt_in (B, T) int64
        starting with BOS -> logits (B, T, V), attention (B, T, S), copy gate (B, T), and
        with heads=True each attention head's weights (B, H, T, S)."""
        enc = self.encode(src, src_lens)
        emb = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        pre, weights = self.decoder(
            emb, self.init_state(enc), enc, heads
        )  # (B, T, D), (B, [H,] T, S)
        per_head = None
        if heads:
            per_head, weights = weights, weights.mean(1)  # (B, H, T, S), (B, T, S)
        gate = None
        if self.copy_gate is not None:  # the mixture itself is formed by the loss
            gate = self.copy_gate(pre, weighted_sum(weights, enc.states), emb)  # (B, T)
        logits = self.generator(pre)
        return Output(logits=logits, attention=weights, src=src, gate=gate, heads=per_head)


def _embedding(vocab_size: int, size: int, pad_id: int) -> nn.Embedding:
    """An embedding with N(0, 1/E) init: unit-variance rows would give huge tied logits."""
    emb = nn.Embedding(vocab_size, size, padding_idx=pad_id)
    nn.init.normal_(emb.weight, std=size**-0.5)
    with torch.no_grad():
        emb.weight[pad_id].zero_()
    return emb


# The nn.init functions that torch's layers (Linear, GRU, LSTM, Embedding) and `_embedding`
# call in their constructors.
_INIT_FUNCTIONS = ("uniform_", "normal_", "kaiming_uniform_", "xavier_uniform_", "zeros_", "ones_")


@contextlib.contextmanager
def _random_init_skipped() -> Iterator[None]:
    """Layers built inside keep their weights as allocated (uninitialised memory), for a
    caller that overwrites every one: drawing 8M random numbers is most of the time a
    model takes to build, and the translate command's start-up pays it for nothing."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    try:
        for name in _INIT_FUNCTIONS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def build_model(
    cfg: ModelConfig,
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int = 0,
    shared_vocab: bool,
    initialise: bool = True,
) -> Seq2Seq:
    """The Seq2Seq model that `cfg` describes; the only place that reads ModelConfig.

    `initialise=False`: the weights are left uninitialised, for a caller that loads them all
    (`load_state_dict`, strict) straight after; it also leaves the random generator alone.
    """
    with contextlib.nullcontext() if initialise else _random_init_skipped():
        model = _assemble(
            cfg,
            src_vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            pad_id=pad_id,
            shared_vocab=shared_vocab,
        )
    if initialise and cfg.init == "uniform":
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-cfg.init_range, cfg.init_range)
            for emb in {model.src_embed, model.tgt_embed}:
                emb.weight[pad_id].zero_()  # padding stays a zero vector
    return model


def _decoder(cfg: ModelConfig, *, context_size: int) -> Decoder:
    """The decoder `cfg` names, with its attention, over encoder states of `context_size`."""
    attention = build_attention(
        cfg.attention,
        query_size=cfg.dec_hidden,
        key_size=context_size,
        hidden_size=cfg.attention_size,
        heads=cfg.attention_heads,
        scope=cfg.attention_scope,
        window=cfg.attention_window,
    )
    shared: dict[str, Any] = {  # what both decoders take
        "cell": cfg.cell,
        "emb_size": cfg.emb_size,
        "context_size": context_size,
        "hidden_size": cfg.dec_hidden,
        "num_layers": cfg.dec_layers,
        "dropout": cfg.dropout,
        "attention": attention,
    }
    decoder: Decoder
    if cfg.decoder == "bahdanau":
        decoder = BahdanauDecoder(**shared)
    else:
        decoder = LuongDecoder(
            **shared,
            input_feeding=cfg.input_feeding,
            linear_output=cfg.attention_output == "linear",
            feed_dropout=cfg.dropout if cfg.feed_dropout else 0.0,
        )
    return decoder


def _assemble(
    cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int, pad_id: int, shared_vocab: bool
) -> Seq2Seq:
    """The modules `cfg` names, put together, each with its layer's own initialisation."""
    if cfg.share_embeddings and not (shared_vocab and src_vocab_size == tgt_vocab_size):
        raise ValueError(
            "model.share_embeddings: needs one joint vocabulary (tokenizer.joint: true), "
            f"got source/target vocabularies of {src_vocab_size}/{tgt_vocab_size} "
            f"(joint: {shared_vocab})"
        )
    tgt_embed = _embedding(tgt_vocab_size, cfg.emb_size, pad_id)
    src_embed = (
        tgt_embed if cfg.share_embeddings else _embedding(src_vocab_size, cfg.emb_size, pad_id)
    )
    encoder = Encoder(
        cell=cfg.cell,
        input_size=cfg.emb_size,
        hidden_size=cfg.enc_hidden,
        num_layers=cfg.enc_layers,
        dropout=cfg.dropout,
    )
    bridge = None
    if cfg.bridge != "none":
        bridge = Bridge(
            enc_size=encoder.output_size,
            dec_hidden=cfg.dec_hidden,
            enc_layers=cfg.enc_layers,
            dec_layers=cfg.dec_layers,
            lstm=cfg.cell == "lstm",
            copy=cfg.bridge == "copy",
        )
    decoder = _decoder(cfg, context_size=encoder.output_size)
    generator = Generator(
        input_size=decoder.output_size,
        vocab_size=tgt_vocab_size,
        dropout=0.0 if cfg.feed_dropout else cfg.dropout,  # else h̃ would be dropped twice
        tie_to=tgt_embed if cfg.tie_embeddings else None,
    )
    copy_gate = None
    if cfg.copy:
        if not shared_vocab:
            raise ValueError("model.copy: needs one joint vocabulary (tokenizer.joint: true)")
        copy_gate = CopyGate(
            pre_size=decoder.output_size, context_size=encoder.output_size, emb_size=cfg.emb_size
        )
    return Seq2Seq(
        copy_gate=copy_gate,
        src_embed=src_embed,
        tgt_embed=tgt_embed,
        encoder=encoder,
        bridge=bridge,
        decoder=decoder,
        generator=generator,
        dropout=cfg.dropout,
        pad_id=pad_id,
    )
