"""The book's helpers around the derivations: glue of computed text into prose (:mod:`.glue`),
the candidate's self-check (:mod:`.check`), explorers' widgets (:mod:`.widgets`) and figures."""
