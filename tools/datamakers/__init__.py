"""Data made on this machine, with nothing downloaded, for the demos, tests and benchmarks.

Each module is a command (`python -m tools.datamakers.<name> --help`) that writes a data set in
the layout a pipeline reads (image class folders, a labelled CSV, a text corpus):

    demo              scikit-learn's handwritten digits as JPEG class folders
    demo_text         a small synthetic review CSV (French, four labels)
    docstring_corpus  the standard library's docstrings, labelled by package (real English),
                      and the unlabelled rest as a language-model corpus
    debian_corpus     Debian's package descriptions, labelled by debtags (multi-label)
    font_glyphs       the letters of the installed typefaces as class folders
    glyph_start       DenseNet121 pretrained on those letters, as a start weights file

Nothing in `components`, `pipelines` or `rehearsal` imports these modules.
"""
