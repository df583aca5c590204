"""Analysis of dumps: the dump format (writer, reader), comparison with msprobe's metrics, overflow
analysis, the HTML report, and msprobe's dump format (export, import). Never imports TensorFlow: it
runs where only the dumps are."""
