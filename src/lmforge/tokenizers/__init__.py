"""Text to ids: BERT's basic pre-tokenizer, the WordPiece trainer and the BERT-exact encoder."""

from lmforge.tokenizers.basic import BasicTokenizer
from lmforge.tokenizers.trainer import Merge, WordPieceTrainer, train_wordpiece
from lmforge.tokenizers.vocab import load_vocab, save_vocab
from lmforge.tokenizers.wordpiece import BatchEncoding, Encoding, WordPieceTokenizer

__all__ = [
    "BasicTokenizer", "BatchEncoding", "Encoding", "Merge", "WordPieceTokenizer", "WordPieceTrainer",
    "load_vocab", "save_vocab", "train_wordpiece",
]
