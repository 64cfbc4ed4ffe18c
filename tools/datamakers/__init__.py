"""Data made on this machine, with nothing downloaded, for the demos, tests and benchmarks.

Each module but `zipf_corpus` is a command (`python -m tools.datamakers.<name> --help`) that
writes a data set in the layout a pipeline reads (image class folders, a labelled CSV, a text
corpus, a model folder):

    demo                scikit-learn's handwritten digits as JPEG class folders
    demo_text           a small synthetic review CSV (French, four labels)
    docstring_corpus    the standard library's docstrings, labelled by package (real English),
                        and the unlabelled rest as a language-model corpus
    debian_corpus       Debian's package descriptions, labelled by debtags (multi-label)
    manpage_corpus      the installed manual pages as prose, a language-model corpus
    tuxpaint_photos     Tux Paint's stamp photographs as image class folders
    font_glyphs         the letters of the installed typefaces as class folders
    glyph_start         DenseNet121 pretrained on those letters, as a start weights file
    tiny_transformer    a small BERT from scratch on a CSV's texts, as a `--model-name` folder
    kubeflow_demo_data  the tiny data `tools.rehearsal.kubeflow_demo` uploads before its runs
    zipf_corpus         (a function) made-up words drawn with Zipf's law, any size

Nothing in `components`, `pipelines` or `rehearsal` imports these modules.
"""
