"""The command line, in one room: ``raybatch search | resume | check | estimate | export |
report | init-workload | spaces ...``.

- ``app``: the Typer app and its commands (the console script ``raybatch`` is its ``main``);
- ``args``: parsing the options the commands share (GPUs, devices, sizes), and their help;
- ``tables``: what the commands print (recipes, estimates, the search's summary);
- ``template``: the files ``init-workload`` writes (a workload of raybatch's own, a
  LightningModule, a Hugging Face model), each with its space.
"""
