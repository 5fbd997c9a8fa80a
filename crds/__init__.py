"""The project's CustomResourceDefinitions, as package data (``asrpool.crds``): the
operator applies the ``StreamingASRPool`` schema's defaults itself
(:mod:`asrpool.operator.schema`), so each default is written once, in the CRD.
``kubectl apply -f crds/`` reads only the YAML files here."""
