package lifecycle

// ObjectName exports objectName to the tests.
var ObjectName = objectName
