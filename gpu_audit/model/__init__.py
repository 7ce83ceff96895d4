"""The data model every component reads: what a backend measures (`samples`), the field
catalogue (`fields`), who owns each process (`attribution`) and one cycle's result
(`snapshot`). Pure data: nothing here does I/O or imports a component."""
