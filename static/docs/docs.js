// Starts Swagger UI (vendored from npm `swagger-ui-dist`, static/docs/swagger-ui/) on /v1/docs.
// Everything stays on this origin: the document comes from data-spec-url, and the online
// validator badge (validator.swagger.io) is off.
window.addEventListener("DOMContentLoaded", function () {
  "use strict";
  var root = document.getElementById("swagger-ui");
  window.ui = window.SwaggerUIBundle({
    url: root.getAttribute("data-spec-url"),
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [window.SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    validatorUrl: null,
    defaultModelsExpandDepth: 0
  });
});
