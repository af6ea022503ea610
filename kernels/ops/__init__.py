"""One package per op, ``naive.py`` beside ``fused.py``.

They sit here rather than directly under ``kernels/`` because importing ``kernels.<op>.naive`` would
bind the package ``kernels.<op>`` over the public function ``kernels.<op>``.
"""
