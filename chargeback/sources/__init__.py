"""Where chargeback reads its data: each source returns a `chargeback.model.SourceData`."""
