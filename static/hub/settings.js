// Sandbox settings page: copy the sandbox token.
document.getElementById("copy-token").addEventListener("click", function () {
  var field = document.getElementById("sandbox-token");
  field.select();
  if (navigator.clipboard) navigator.clipboard.writeText(field.value).catch(function () { document.execCommand("copy"); });
  else document.execCommand("copy");
});
