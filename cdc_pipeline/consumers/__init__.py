"""Pull consumers: the HTTP API that `cdc-pipeline serve` runs over the state database's pull queue."""
