"""Results pages: docs/results/<kind>.md generated from the tools' JSON reports in docs/results/data/.

`python -m dualpath.results --write` writes them with their plots (docs/results/img/); `--check`
exits 1 naming each page that differs from what the reports give.
"""
