"""What a user runs, below the command line: typed run configs and the builders that turn them into a Trainer.

``pretrain`` (BERT, RoBERTa, SpanBERT, GPT, ...), ``finetune`` (task heads; also rebuilding a fine-tuned model),
``seq2seq`` (encoder-decoders), ``distill``, ``vectors`` (Word2Vec, GloVe), ``compare`` (pretraining against none on
your own corpus) and ``demo`` (the story ``make demo`` tells); one ``resolve`` of defaults, TOML, flags and overrides
(``lmforge.recipes.resolve``). ``lmforge.commands`` only parses arguments and prints; ``pipelines``, ``serve`` and the
benchmarks use these recipes, never the commands.
"""
