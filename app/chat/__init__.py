"""`qwenlocal chat`: the Textual chat app (app.py), its backends (backend.py, fake.py) and its parts."""
