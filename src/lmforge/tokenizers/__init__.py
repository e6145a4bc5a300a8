"""Text to ids: BERT's basic pre-tokenizer, the WordPiece trainer, the BERT-exact encoder, GPT-2's byte-level
BPE and SentencePiece's Unigram (read from a Hugging Face tokenizer.json)."""

from lmforge.tokenizers.basic import BasicTokenizer
from lmforge.tokenizers.bytebpe import ByteLevelBPETokenizer
from lmforge.tokenizers.trainer import Merge, WordPieceTrainer, train_wordpiece
from lmforge.tokenizers.unigram import UnigramTokenizer
from lmforge.tokenizers.vocab import load_vocab, save_vocab
from lmforge.tokenizers.wordpiece import BatchEncoding, Encoding, WordPieceTokenizer

__all__ = [
    "BasicTokenizer", "BatchEncoding", "ByteLevelBPETokenizer", "Encoding", "Merge", "UnigramTokenizer",
    "WordPieceTokenizer", "WordPieceTrainer", "load_vocab", "save_vocab", "train_wordpiece",
]
