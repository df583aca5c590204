"""Analysis of dumps: the dump format (writer, reader), comparison with msprobe's metrics, overflow
analysis and the HTML report. Never imports TensorFlow: it runs where only the dumps are."""
