"""The pipeline: a recipe (`recipe.py`) names stages from the registry (`stages/`), `compile.py`
runs them with a per-stage cache, and `bundle.py` / `report.py` write what an app developer takes."""
